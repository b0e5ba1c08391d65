"""The dynamic mode: run a training script under measurement (`loopaudit run`) and read
torch.profiler traces (`loopaudit analyze`). Nothing here is imported by the static scan."""
