// Command seqload is a light sequence load generator for seqserve's gRPC stream endpoint,
// written in Go (grpc-go) so that one CPU of a small machine can keep several worker processes
// busy: the Python generators of `python -m bench` (tritonclient) spend 5-10 times more CPU per
// step than the server does, and on a 2-core machine they, not the server, set the load.
//
//	seqload -addr HOST:PORT -model accumulator_oldest_1024 -sequences 256 -conns 4 \
//	        -seconds 8 -warmup 2 -steps 100
//
// Each sequence runs on its own ModelStreamInfer stream (streams are spread over -conns
// connections) one step at a time: send a step, wait for its reply, check the running sum (the
// model must answer OUTPUT = the sum of INPUT since the sequence's start). After -steps steps a
// sequence ends and a new one starts with a new id. It prints "# window open" and "# window
// closed" when the measured window (after -warmup) opens and closes, then one JSON object: the
// window's steps, wrong sums, errors and latency percentiles. Exit status 1: a usage error or
// no connection.
package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"

	pb "seqserve/inference"
)

type counters struct {
	measuring int32 // 1 while the measured window is open
	steps     int64
	wrong     int64
	errors    int64
}

type worker struct {
	latencies []time.Duration // of measured steps only
	firstErr  string
}

func main() {
	addr := flag.String("addr", "", "host:port of the gRPC server")
	model := flag.String("model", "accumulator_oldest_1024", "a running-sum sequence model (INPUT -> OUTPUT, FP32 [1])")
	sequences := flag.Int("sequences", 256, "sequences in flight, each on its own stream")
	conns := flag.Int("conns", 4, "gRPC connections the streams are spread over")
	seconds := flag.Float64("seconds", 8, "length of the measured window")
	warmup := flag.Float64("warmup", 2, "seconds of load before the measured window")
	steps := flag.Int("steps", 100, "steps of each sequence before it ends and a new one starts")
	idBase := flag.Int64("id-base", time.Now().UnixNano()&0x3fffffffffff, "first sequence id")
	flag.Parse()
	if *addr == "" || *sequences < 1 || *conns < 1 || *steps < 1 || *seconds <= 0 || *warmup < 0 {
		fail("usage: seqload -addr HOST:PORT [-model M] [-sequences N] [-conns C] [-seconds S] [-warmup W] [-steps K]")
	}
	clients := make([]pb.GRPCInferenceServiceClient, *conns)
	for i := range clients {
		dialCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		conn, err := grpc.DialContext(dialCtx, *addr, grpc.WithInsecure(), grpc.WithBlock())
		cancel()
		if err != nil {
			fail("dial %s: %v", *addr, err)
		}
		defer conn.Close()
		clients[i] = pb.NewGRPCInferenceServiceClient(conn)
	}

	var c counters
	ctx, stop := context.WithCancel(context.Background())
	workers := make([]*worker, *sequences)
	var wg sync.WaitGroup
	for i := range workers {
		w := &worker{}
		workers[i] = w
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			w.run(ctx, clients[i%len(clients)], *model, *idBase+int64(i)*1_000_000, *steps, &c)
		}(i)
	}
	time.Sleep(time.Duration(*warmup * float64(time.Second)))
	atomic.StoreInt32(&c.measuring, 1)
	began := time.Now()
	fmt.Println("# window open") // a caller sampling the server's CPU does it now, and at the close
	time.Sleep(time.Duration(*seconds * float64(time.Second)))
	atomic.StoreInt32(&c.measuring, 0)
	elapsed := time.Since(began).Seconds()
	fmt.Println("# window closed")
	stop()
	wg.Wait()

	var all []time.Duration
	firstErr := ""
	for _, w := range workers {
		all = append(all, w.latencies...)
		if firstErr == "" {
			firstErr = w.firstErr
		}
	}
	sort.Slice(all, func(a, b int) bool { return all[a] < all[b] })
	pct := func(p float64) float64 {
		if len(all) == 0 {
			return 0
		}
		return float64(all[int(p*float64(len(all)-1))].Microseconds()) / 1000
	}
	report := map[string]interface{}{
		"sequences": *sequences, "conns": *conns, "seconds": elapsed,
		"steps": c.steps, "steps_per_s": float64(c.steps) / elapsed,
		"wrong": c.wrong, "errors": c.errors,
		"p50_ms": pct(0.50), "p90_ms": pct(0.90), "p99_ms": pct(0.99),
	}
	if firstErr != "" {
		report["first_error"] = firstErr
	}
	out, _ := json.Marshal(report)
	fmt.Println(string(out))
}

// run drives sequences one after another on one stream until ctx ends; a stream that fails is
// counted as an error and replaced.
func (w *worker) run(ctx context.Context, client pb.GRPCInferenceServiceClient, model string, id int64, steps int, c *counters) {
	for ctx.Err() == nil {
		stream, err := client.ModelStreamInfer(ctx)
		if err != nil {
			w.failed(ctx, c, fmt.Sprintf("ModelStreamInfer: %v", err))
			continue
		}
		for ctx.Err() == nil {
			id++
			if !w.sequence(stream, model, id, steps, c) {
				break
			}
		}
		_ = stream.CloseSend()
	}
}

// sequence runs one sequence of `steps` steps on the stream; false when the stream failed.
func (w *worker) sequence(stream pb.GRPCInferenceService_ModelStreamInferClient, model string, id int64, steps int, c *counters) bool {
	var sum float32
	raw := make([]byte, 4)
	for i := 1; i <= steps; i++ {
		value := float32(i%7 + 1)
		sum += value
		binary.LittleEndian.PutUint32(raw, math.Float32bits(value))
		req := &pb.ModelInferRequest{
			ModelName: model,
			Parameters: map[string]*pb.InferParameter{
				"sequence_id":    {ParameterChoice: &pb.InferParameter_Int64Param{Int64Param: id}},
				"sequence_start": {ParameterChoice: &pb.InferParameter_BoolParam{BoolParam: i == 1}},
				"sequence_end":   {ParameterChoice: &pb.InferParameter_BoolParam{BoolParam: i == steps}},
			},
			Inputs:           []*pb.ModelInferRequest_InferInputTensor{{Name: "INPUT", Datatype: "FP32", Shape: []int64{1, 1}}},
			RawInputContents: [][]byte{raw},
		}
		sent := time.Now()
		if err := stream.Send(req); err != nil {
			w.failed(stream.Context(), c, fmt.Sprintf("send: %v", err))
			return false
		}
		reply, err := stream.Recv()
		if err != nil {
			w.failed(stream.Context(), c, fmt.Sprintf("recv: %v", err))
			return false
		}
		took := time.Since(sent)
		measuring := atomic.LoadInt32(&c.measuring) == 1
		if reply.ErrorMessage != "" {
			if measuring {
				atomic.AddInt64(&c.errors, 1)
			}
			if w.firstErr == "" {
				w.firstErr = reply.ErrorMessage
			}
			return true // the server refused this sequence: start the next one
		}
		if !measuring {
			continue
		}
		atomic.AddInt64(&c.steps, 1)
		w.latencies = append(w.latencies, took)
		resp := reply.InferResponse
		if resp == nil || len(resp.RawOutputContents) == 0 || len(resp.RawOutputContents[0]) < 4 ||
			math.Float32frombits(binary.LittleEndian.Uint32(resp.RawOutputContents[0][:4])) != sum {
			atomic.AddInt64(&c.wrong, 1)
		}
	}
	return true
}

// failed counts a stream failure, unless it is the end of the run cancelling the stream.
func (w *worker) failed(ctx context.Context, c *counters, msg string) {
	if ctx.Err() != nil {
		return
	}
	atomic.AddInt64(&c.errors, 1)
	if w.firstErr == "" {
		w.firstErr = msg
	}
	time.Sleep(10 * time.Millisecond)
}

func fail(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
	os.Exit(1)
}
