"""Sampling: parameters, token selection, speculative verification."""

from agentrt.records.params import SamplingParams
from agentrt.sampling.sampler import adjusted_probs, make_generator, sample_batch, sample_row

__all__ = ["SamplingParams", "adjusted_probs", "make_generator", "sample_batch", "sample_row"]
