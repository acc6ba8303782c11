"""Token-level BugFix-style agent simulator."""
