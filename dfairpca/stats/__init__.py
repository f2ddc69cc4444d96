"""The additive statistics: one chunk's sums, their pairwise merge, :class:`Moments`."""
