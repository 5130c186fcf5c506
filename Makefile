# Developer helpers. The generated protobuf modules are committed, so none of
# this is needed to build or install the package.

PYTHON ?= python
PROTO_DIR := protos
PROTO_OUT := src/seqserve/_proto
PROTOS := $(wildcard $(PROTO_DIR)/*.proto)

.PHONY: protos
# Regenerate src/seqserve/_proto from protos/*.proto, then fix up what protoc
# writes for a top-level module:
#  * `import x_pb2` between our protos -> `from seqserve._proto import x_pb2`;
#  * register descriptors in seqserve._proto.POOL instead of protobuf's default
#    pool, which tritonclient's modules of the same names (package
#    `inference`) also use: sharing it makes importing both an error;
#  * the module name given to the builder, so messages pickle.
protos:
	$(PYTHON) -m grpc_tools.protoc -I$(PROTO_DIR) \
		--python_out=$(PROTO_OUT) --pyi_out=$(PROTO_OUT) \
		--grpc_python_out=$(PROTO_OUT) $(PROTOS)
	sed -i -E 's/^import ([A-Za-z0-9_]+_pb2(_grpc)?) as /from seqserve._proto import \1 as /' \
		$(PROTO_OUT)/*_pb2.py $(PROTO_OUT)/*_pb2.pyi $(PROTO_OUT)/*_pb2_grpc.py
	sed -i -E \
		-e 's/^DESCRIPTOR = _descriptor_pool\.Default\(\)\./DESCRIPTOR = _POOL./' \
		-e 's/^(# @@protoc_insertion_point\(imports\))$$/from seqserve._proto import POOL as _POOL\n\1/' \
		-e "s/^(_builder\.BuildTopDescriptorsAndMessages\(DESCRIPTOR, )'([A-Za-z0-9_]+_pb2)'/\1'seqserve._proto.\2'/" \
		$(PROTO_OUT)/*_pb2.py
