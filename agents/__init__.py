"""The compute agent: node index, fit checks and virt drivers."""
