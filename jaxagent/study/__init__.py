"""The study's stages as library functions (the experiments/ scripts are thin wrappers around them)."""
