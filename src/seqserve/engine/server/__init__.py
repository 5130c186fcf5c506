"""The in-process server: ``Server`` is a façade over the parts it owns: the model table (the
loaded models and every change to them), the drain (shutdown) and, with a state store, the
replica coordinator (``seqserve.engine.replicas``)."""
