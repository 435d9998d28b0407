"""`cache`: integrity of the Triton, Inductor and autotune disk caches, and a repair that loses nothing.

`roots` finds the caches the way triton and torch do; `layout` says what the two write into a root
(whether a folder is a cache root, which paths are its entries); `triton_scan` and `inductor_scan`
check each entry against that layout and the write protocol triton and Inductor use (never
importing, executing or unpickling anything); `environment` checks where a root lives; `quarantine`
moves broken entries aside with a manifest and puts them back byte-identical. Doctor side: standard
library only.
"""
