"""The embedding benchmark (``python -m benchmarks.embed`` runs :mod:`.embed`), where a
batched build's time goes (``python -m benchmarks.embed.embed_timeline``) and the build
on a GPU (``python -m benchmarks.embed.gpu_embed``)."""
