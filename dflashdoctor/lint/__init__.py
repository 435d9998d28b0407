"""`dflashdoctor lint`: the flex_attention patterns that make a long run dense or racy, found in the
source with `ast` alone (no torch needed, nothing imported): sources.py finds and reads the files,
facts.py reads one file (varying.py follows lengths into static wrappers, threads.py follows thread
targets to model and kernel steps, both on scopes.py), rules.py judges; setup_facts.py is what
`init` reads."""
