// Command seqclient drives a seqserve gRPC endpoint with grpc-go, an implementation that shares
// no code with seqserve or grpcio. tests/interop/test_grpc_go.py builds it in GOPATH mode from
// Debian's Go packages, against Go code that protoc generates from protos/ into the package
// seqserve/inference, and runs one check per invocation:
//
//	seqclient -addr HOST:PORT health
//	seqclient -addr HOST:PORT sequence -model accumulator -steps 20
//	seqclient -addr HOST:PORT metadata -entries 130
//
// Each check prints one JSON object on stdout and exits 0 when every expectation held; a broken
// expectation is printed on stderr with exit status 1.
package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	pb "seqserve/inference"
)

const callTimeout = 30 * time.Second

func main() {
	addr := flag.String("addr", "", "host:port of the gRPC server")
	flag.Parse()
	if *addr == "" || flag.NArg() < 1 {
		fail("usage: seqclient -addr HOST:PORT health|sequence|metadata [flags]")
	}
	conn, err := grpc.Dial(*addr, grpc.WithInsecure(), grpc.WithBlock(), grpc.WithTimeout(callTimeout))
	if err != nil {
		fail("dial %s: %v", *addr, err)
	}
	defer conn.Close()
	client := pb.NewGRPCInferenceServiceClient(conn)

	args := flag.Args()[1:]
	var report map[string]interface{}
	switch flag.Arg(0) {
	case "health":
		report = health(client)
	case "sequence":
		sub := flag.NewFlagSet("sequence", flag.ExitOnError)
		model := sub.String("model", "accumulator", "a running-sum sequence model (INPUT -> OUTPUT, FP32)")
		steps := sub.Int("steps", 20, "steps of each sequence")
		id := sub.Int64("id", time.Now().UnixNano()&0x3fffffffffff, "sequence id of the unary sequence; the stream's is id+1")
		_ = sub.Parse(args)
		report = sequence(client, *model, *steps, *id)
	case "metadata":
		sub := flag.NewFlagSet("metadata", flag.ExitOnError)
		entries := sub.Int("entries", 130, "metadata entries on the call")
		_ = sub.Parse(args)
		report = manyMetadata(client, *entries)
	default:
		fail("unknown check %q", flag.Arg(0))
	}
	out, _ := json.Marshal(report)
	fmt.Println(string(out))
}

func fail(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
	os.Exit(1)
}

func callContext() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), callTimeout)
}

// health: ServerLive, ServerReady and ServerMetadata answer, and the server names itself.
func health(client pb.GRPCInferenceServiceClient) map[string]interface{} {
	ctx, cancel := callContext()
	defer cancel()
	live, err := client.ServerLive(ctx, &pb.ServerLiveRequest{})
	if err != nil || !live.Live {
		fail("ServerLive: live=%v err=%v", live.GetLive(), err)
	}
	ready, err := client.ServerReady(ctx, &pb.ServerReadyRequest{})
	if err != nil || !ready.Ready {
		fail("ServerReady: ready=%v err=%v", ready.GetReady(), err)
	}
	meta, err := client.ServerMetadata(ctx, &pb.ServerMetadataRequest{})
	if err != nil || meta.Name == "" {
		fail("ServerMetadata: %v err=%v", meta, err)
	}
	return map[string]interface{}{"live": live.Live, "ready": ready.Ready, "name": meta.Name, "version": meta.Version}
}

// stepRequest is one step of sequence `id`: INPUT = value, with Triton's sequence parameters.
func stepRequest(model string, id int64, value float32, start, end bool) *pb.ModelInferRequest {
	raw := make([]byte, 4)
	binary.LittleEndian.PutUint32(raw, math.Float32bits(value))
	return &pb.ModelInferRequest{
		ModelName: model,
		Parameters: map[string]*pb.InferParameter{
			"sequence_id":    {ParameterChoice: &pb.InferParameter_Int64Param{Int64Param: id}},
			"sequence_start": {ParameterChoice: &pb.InferParameter_BoolParam{BoolParam: start}},
			"sequence_end":   {ParameterChoice: &pb.InferParameter_BoolParam{BoolParam: end}},
		},
		Inputs:           []*pb.ModelInferRequest_InferInputTensor{{Name: "INPUT", Datatype: "FP32", Shape: []int64{1, 1}}},
		RawInputContents: [][]byte{raw},
	}
}

func firstOutput(resp *pb.ModelInferResponse) float32 {
	if resp == nil || len(resp.RawOutputContents) == 0 || len(resp.RawOutputContents[0]) < 4 {
		fail("response without a raw output: %v", resp)
	}
	return math.Float32frombits(binary.LittleEndian.Uint32(resp.RawOutputContents[0][:4]))
}

// sequence runs two sequences side by side, one over unary ModelInfer calls and one over a
// ModelStreamInfer stream, and checks the running sum after every step of each.
func sequence(client pb.GRPCInferenceServiceClient, model string, steps int, id int64) map[string]interface{} {
	ctx, cancel := context.WithTimeout(context.Background(), 4*callTimeout)
	defer cancel()
	stream, err := client.ModelStreamInfer(ctx)
	if err != nil {
		fail("ModelStreamInfer: %v", err)
	}
	var unarySum, streamSum float32
	for i := 1; i <= steps; i++ {
		start, end := i == 1, i == steps
		unarySum += float32(i)
		resp, err := client.ModelInfer(ctx, stepRequest(model, id, float32(i), start, end))
		if err != nil {
			fail("ModelInfer step %d: %v", i, err)
		}
		if got := firstOutput(resp); got != unarySum {
			fail("unary step %d: sum %v, want %v", i, got, unarySum)
		}
		streamSum += float32(2 * i)
		if err := stream.Send(stepRequest(model, id+1, float32(2*i), start, end)); err != nil {
			fail("stream send step %d: %v", i, err)
		}
		reply, err := stream.Recv()
		if err != nil {
			fail("stream recv step %d: %v", i, err)
		}
		if reply.ErrorMessage != "" {
			fail("stream step %d: %s", i, reply.ErrorMessage)
		}
		if got := firstOutput(reply.InferResponse); got != streamSum {
			fail("stream step %d: sum %v, want %v", i, got, streamSum)
		}
	}
	if err := stream.CloseSend(); err != nil {
		fail("stream close: %v", err)
	}
	if _, err := stream.Recv(); err != io.EOF {
		fail("stream end: %v, want a clean end", err)
	}
	return map[string]interface{}{"steps": steps, "unary_sum": unarySum, "stream_sum": streamSum}
}

// manyMetadata opens a stream, makes a ServerLive call that carries `entries` metadata entries
// (grpc-go sends each as a header field), then checks that the stream still works: a limit that
// one call hits must not end the connection that the other calls share.
func manyMetadata(client pb.GRPCInferenceServiceClient, entries int) map[string]interface{} {
	ctx, cancel := context.WithTimeout(context.Background(), 2*callTimeout)
	defer cancel()
	id := time.Now().UnixNano() & 0x3fffffffffff
	stream, err := client.ModelStreamInfer(ctx)
	if err != nil {
		fail("ModelStreamInfer: %v", err)
	}
	step := func(i int, value float32) {
		if err := stream.Send(stepRequest("accumulator", id, value, i == 1, i == 2)); err != nil {
			fail("stream send step %d: %v", i, err)
		}
		reply, err := stream.Recv()
		if err != nil {
			fail("stream step %d after the metadata call: %v", i, err)
		}
		if reply.ErrorMessage != "" {
			fail("stream step %d: %s", i, reply.ErrorMessage)
		}
	}
	step(1, 1)

	pairs := make([]string, 0, 2*entries)
	for i := 0; i < entries; i++ {
		pairs = append(pairs, fmt.Sprintf("x-interop-%03d", i), strings.Repeat("v", 16))
	}
	callCtx := metadata.AppendToOutgoingContext(ctx, pairs...)
	_, callErr := client.ServerLive(callCtx, &pb.ServerLiveRequest{})
	code := status.Code(callErr).String()

	step(2, 2)
	if err := stream.CloseSend(); err != nil {
		fail("stream close: %v", err)
	}
	if _, err := stream.Recv(); err != io.EOF {
		fail("stream end: %v, want a clean end", err)
	}
	report := map[string]interface{}{"entries": entries, "code": code, "stream_survived": true}
	if callErr != nil {
		report["message"] = status.Convert(callErr).Message()
	}
	return report
}
