"""Reading a store: mapped segments, their overlay, and the :class:`CacheStore` handle."""
