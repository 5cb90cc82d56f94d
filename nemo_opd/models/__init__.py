"""Model-format conversion (Hugging Face <-> Megatron)."""
