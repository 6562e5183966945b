"""The public API with real files: build, open, read, cached(), locations, identity, progress,
the image loader, batch loaders, pandas, the command line."""
