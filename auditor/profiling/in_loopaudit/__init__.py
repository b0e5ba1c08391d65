"""What runs in the `loopaudit` process: starting the script under the probe (runner.py), reading
profiler traces (trace.py, trace_stream.py, trace_analysis.py, intervals.py), turning measurements
into the runtime rules' evidence and findings (evidence.py, audit.py) and the step-time breakdown
(breakdown.py, timing.py). Nothing here imports torch."""
