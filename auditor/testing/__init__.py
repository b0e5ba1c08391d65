"""What a user's own test suite may use: `sync_budget`, which fails a test when the code inside
synchronizes the host with the GPU more often than allowed (sync_budget.py), and the pytest plugin
that offers it as a marker and a fixture (pytest_plugin.py). Runs in the user's process; imports
torch only when a budget is opened."""
