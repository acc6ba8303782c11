"""creditlens service: store episodes, compute per-token advantages, render them."""
