"""specviz: real speculative decoding on small model pairs, recorded round by round."""

__version__ = "0.1.0"
