"""The comparison wing: `clarify compare` runs several models on one question set (compare), sizes them
to the GPUs (gpu_plan) and reads the models file (models_file)."""
