"""KServe v2 / Triton over gRPC: the servicers (``servicer``), ModelStreamInfer's session
(``stream``), the protobuf request codec (``codec``), the reply wire encoder (``wire``), the
error-to-status table (``status``), the method table both servers serve (``methods``), the
grpc.aio adapter (``aio``) and the start of either server (``serve``)."""
