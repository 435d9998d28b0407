"""`dflashdoctor gate`: the probes that apply, against budgets, as one pass/fail step."""
