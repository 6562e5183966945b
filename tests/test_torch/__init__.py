"""tensorstore_cache.torch: datasets under real DataLoaders, the sampler, resumes, batch
transforms, a real DDP job."""
