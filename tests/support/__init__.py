"""What the suites share and the programs that are not tests: loaders, clients and stores
the tests build with, hypothesis strategies, the soak (``python -m tests.support.soak``),
the module graph (``python -m tests.support.module_graph``), the layer-call tracer
(``python -m tests.support.layer_calls``) and the runner of the pages' examples
(``python -m tests.support.docblocks``)."""
