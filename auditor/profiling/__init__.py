"""The dynamic mode: run a training script under measurement (`loopaudit run`) and read
torch.profiler traces (`loopaudit analyze`). `in_script/` runs inside the user's script's process,
`in_loopaudit/` in loopaudit's own. Nothing here is imported by the static scan."""
