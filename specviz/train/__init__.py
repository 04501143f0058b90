"""Training the EAGLE-style draft head on what the target itself says: its features and laws collected once, a seeded run."""
