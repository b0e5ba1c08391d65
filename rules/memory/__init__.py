"""LA4xx: allocator and memory: per-step allocator calls, graphs kept alive, gradient memsets."""
