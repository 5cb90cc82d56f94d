"""Process groups, device meshes and the collectives that combine vocab-parallel shards."""
