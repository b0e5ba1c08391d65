"""LA1xx: host-device synchronizations on the per-step path of CUDA code."""
