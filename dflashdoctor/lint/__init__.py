"""`dflashdoctor lint`: the flex_attention patterns that make a long run dense or racy, found in the
source with `ast` alone (no torch needed, nothing imported): facts.py reads a file, rules.py judges."""
