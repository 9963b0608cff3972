"""Analysis: reads the files runs leave (results.json, plan.json) and judges them (compare). Reads the
core only."""
