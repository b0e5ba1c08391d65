"""LA7xx: distributed training (DDP, FSDP, Accelerate, Lightning)."""
