"""Doctor-side judges: a probe's observations in, checks and findings out."""
