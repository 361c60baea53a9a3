"""Studies built on traces of speculative decoding runs."""
