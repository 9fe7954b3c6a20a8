"""Features woven through the stages: the compile-option search (tune, rounds), static batch
sizes, precision, shared constants, convolution weight prepacking, and builds from a checkpoint
folder (hf, hf_tasks)."""
