"""What every layer shares and nothing of ours is imported by: config errors and strict dataclass
building, atomic artifact writes, the git revision. Stays at the bottom of the import graph."""
