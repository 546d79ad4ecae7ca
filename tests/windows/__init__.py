"""The Windows code paths on a real Windows (the CI's Windows job); skipped everywhere else."""
