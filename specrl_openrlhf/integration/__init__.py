"""Everything that imports vLLM, Ray or OpenRLHF lives here; the rest of the package needs only torch/numpy."""
