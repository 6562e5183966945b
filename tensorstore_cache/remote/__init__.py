"""Remote transport: copy a store between an fsspec URL and a local directory."""
