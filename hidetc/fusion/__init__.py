"""Post-scheduling fusion: `partition` groups nodes around anchors; `graft` rewrites an
anchor's built kernel so its loads compute the prologues and its stores the epilogues."""
