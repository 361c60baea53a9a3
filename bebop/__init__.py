"""bebop: speculative rollouts with an MTP draft and lossless rejection sampling."""

__version__ = "0.1.0"
