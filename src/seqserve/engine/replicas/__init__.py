"""The replica machinery: sequences that move between servers. A sequence's checkpoint and its
binary format, the shared store where released sequences wait, and the coordinator that hands
this replica's sequences off and takes arriving ones over (docs/state-store.md)."""
