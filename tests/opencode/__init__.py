"""The built-in opencode deliverer and verifier: against the fake server, a hostile one and a
real ``opencode serve``."""
