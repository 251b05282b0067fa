"""Storage: the verified, atomic run store, orbax checkpoints, compiled programs kept on disk.
"""
