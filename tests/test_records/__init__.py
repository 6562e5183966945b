"""Stores of records (format 2): fields, gc beside their readers, hostile stores, PyTorch."""
