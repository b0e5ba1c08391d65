"""LA6xx: rules checked by running the script (`loopaudit run`) or reading a trace (`loopaudit analyze`)."""
