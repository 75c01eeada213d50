"""Tree of Clarifications, breadth-first across questions; run directories; the CLI."""
