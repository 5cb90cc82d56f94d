"""What the package knows about model families, below every floor that runs a model: the
output head (output_head.py), which the losses' chunked head, the engines, the teacher's LM
head and the setup checks all ask, and which families' heads it reproduces (head_families.py,
without torch: the command line's pre-flight asks it too)."""
