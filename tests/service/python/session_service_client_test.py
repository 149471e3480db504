"""An independent client of graphrun's SessionService, in Python.

Runs the real graphrun-server binary and talks to it with Debian's
python3-grpcio and python3-protobuf only (no numpy), through stubs that the
build generates with protoc --python_out and grpc_python_plugin:

    /usr/bin/python3 session_service_client_test.py \
        --server build/tools/graphrun-server/graphrun-server \
        --stubs build/tests/service/python/stubs

Exit status 77 (ctest's SKIP_RETURN_CODE) when grpc or protobuf cannot be
imported by this interpreter.
"""

import argparse
import os
import re
import signal
import struct
import subprocess
import sys
import threading
import unittest

SKIP = 77
RPC_TIMEOUT = 30  # seconds, for every call
STARTUP_TIMEOUT = 30
LISTENING = re.compile(r"^graphrun-server listening on (\S+)$")

# Filled in by main() before the tests run.
SERVER = None
grpc = None
pb = None  # module namespace of the generated stubs


class Stubs:
    """The generated modules, imported once --stubs is on sys.path."""

    def __init__(self, stubs_dir):
        sys.path.insert(0, stubs_dir)
        sys.path.insert(0, os.path.join(stubs_dir, "health"))
        from graphrun.v1 import graph_pb2, tensor_pb2
        from graphrun.v1 import session_service_pb2, session_service_pb2_grpc
        from graphrun.v1 import types_pb2
        import health_pb2
        import health_pb2_grpc
        self.graph = graph_pb2
        self.tensor = tensor_pb2
        self.types = types_pb2
        self.service = session_service_pb2
        self.service_grpc = session_service_pb2_grpc
        self.health = health_pb2
        self.health_grpc = health_pb2_grpc


# --- tensors: tensor_content is little-endian -----------------------------

FORMATS = {}  # DataType value -> struct code; filled by main()


def tensor_proto(dtype, dims, values):
    """A TensorProto with tensor_content holding `values`."""
    t = pb.tensor.TensorProto()
    t.dtype = dtype
    for d in dims:
        t.tensor_shape.dim.add().size = d
    t.tensor_content = struct.pack("<%d%s" % (len(values), FORMATS[dtype]),
                                   *values)
    return t


def tensor_values(t):
    """The dims and values of a TensorProto sent with tensor_content."""
    dims = [d.size for d in t.tensor_shape.dim]
    code = FORMATS[t.dtype]
    count = len(t.tensor_content) // struct.calcsize(code)
    return dims, list(struct.unpack("<%d%s" % (count, code),
                                    t.tensor_content))


# --- graphs: NodeDefs written by hand -------------------------------------

class GraphBuilder:
    """Appends NodeDefs to a GraphDef, TensorFlow style."""

    def __init__(self):
        self.graph_def = pb.graph.GraphDef()

    def node(self, name, op, inputs=(), **attrs):
        n = self.graph_def.node.add()
        n.name = name
        n.op = op
        n.input.extend(inputs)
        for key, value in attrs.items():
            value(n.attr[key])
        return name


def type_attr(dtype):
    def set_value(v):
        v.type = dtype
    return set_value


def shape_attr(dims):
    def set_value(v):
        v.shape.SetInParent()
        for d in dims:
            v.shape.dim.add().size = d
    return set_value


def string_attr(s):
    def set_value(v):
        v.s = s.encode()
    return set_value


def tensor_attr(tensor):
    def set_value(v):
        v.tensor.CopyFrom(tensor)
    return set_value


def const(g, name, dtype, dims, values):
    return g.node(name, "Const", dtype=type_attr(dtype),
                  value=tensor_attr(tensor_proto(dtype, dims, values)))


def placeholder(g, name, dtype, dims):
    return g.node(name, "Placeholder", dtype=type_attr(dtype),
                  shape=shape_attr(dims))


def binary(g, name, op, a, b, dtype):
    return g.node(name, op, [a, b], T=type_attr(dtype))


def seed_example():
    """Issue 5's seed example, in TensorFlow's form (VariableV2, two-input
    Assign and AssignAdd): a RandomUniform draw that runs after an
    AssignAdd counter, feeding two products y1 = draw * a, y2 = draw * b."""
    f32 = pb.types.DT_FLOAT
    g = GraphBuilder()
    g.node("count", "VariableV2", dtype=type_attr(f32), shape=shape_attr([]),
           container=string_attr(""), shared_name=string_attr(""))
    const(g, "zero", f32, [], [0.0])
    binary(g, "count/Assign", "Assign", "count", "zero", f32)
    g.node("init", "NoOp", ["^count/Assign"])
    const(g, "one", f32, [], [1.0])
    binary(g, "inc", "AssignAdd", "count", "one", f32)
    const(g, "draw/shape", pb.types.DT_INT32, [0], [])
    g.node("draw", "RandomUniform", ["draw/shape", "^inc"],
           T=type_attr(pb.types.DT_INT32), dtype=type_attr(f32))
    g.node("expensive", "Identity", ["draw"], T=type_attr(f32))
    placeholder(g, "a", f32, [])
    placeholder(g, "b", f32, [])
    binary(g, "y1", "Mul", "expensive", "a", f32)
    binary(g, "y2", "Mul", "expensive", "b", f32)
    return g.graph_def


# --- the server process ---------------------------------------------------

class ServerProcess:
    """graphrun-server --listen 127.0.0.1:0, its address read from the first
    stdout line; the rest of stdout is drained so the server never blocks."""

    def __init__(self, path):
        self.process = subprocess.Popen(
            [path, "--listen", "127.0.0.1:0"], stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL, text=True)
        first = []
        reader = threading.Thread(
            target=lambda: first.append(self.process.stdout.readline()),
            daemon=True)
        reader.start()
        reader.join(STARTUP_TIMEOUT)
        if not first:
            self.process.kill()
            raise RuntimeError("graphrun-server printed nothing in %d s"
                               % STARTUP_TIMEOUT)
        line = first[0].rstrip("\n")
        match = LISTENING.match(line)
        if not match:
            self.process.kill()
            raise RuntimeError("graphrun-server's first line is %r, not "
                               "'graphrun-server listening on <host:port>'"
                               % line)
        self.address = match.group(1)
        self.drain = threading.Thread(target=self.process.stdout.read,
                                      daemon=True)
        self.drain.start()
        self.channel = grpc.insecure_channel(self.address)
        grpc.channel_ready_future(self.channel).result(timeout=STARTUP_TIMEOUT)

    def terminate(self):
        """SIGTERM; returns the exit code (None when it did not exit)."""
        self.channel.close()
        self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(timeout=STARTUP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            code = None
        self.drain.join(STARTUP_TIMEOUT)
        self.process.stdout.close()
        return code


class SessionServiceClientTest(unittest.TestCase):
    """Sessions, runs, partial runs and errors against one server."""

    @classmethod
    def setUpClass(cls):
        cls.server = ServerProcess(SERVER)
        cls.stub = pb.service_grpc.SessionServiceStub(cls.server.channel)

    @classmethod
    def tearDownClass(cls):
        code = cls.server.terminate()
        if code != 0:
            raise AssertionError("graphrun-server exited with %r after SIGTERM"
                                 % code)

    def create(self, graph_def):
        request = pb.service.CreateSessionRequest(graph_def=graph_def)
        response = self.stub.CreateSession(request, timeout=RPC_TIMEOUT)
        self.assertTrue(response.session_handle.startswith("s-"))
        return response.session_handle

    def run_step(self, handle, feeds=(), fetches=(), targets=()):
        request = pb.service.RunRequest(session_handle=handle)
        for name, tensor in feeds:
            request.feed.add(name=name, tensor=tensor)
        request.fetch.extend(fetches)
        request.target.extend(targets)
        return self.stub.Run(request, timeout=RPC_TIMEOUT)

    def assert_rpc_error(self, code, call, *args):
        with self.assertRaises(grpc.RpcError) as caught:
            call(*args)
        self.assertEqual(caught.exception.code(), code,
                         caught.exception.details())
        return caught.exception.details()

    def test_run_feeds_and_fetches_by_name(self):
        f32 = pb.types.DT_FLOAT
        g = GraphBuilder()
        placeholder(g, "x", f32, [3])
        const(g, "c", f32, [3], [1.0, 2.0, 3.0])
        binary(g, "m", "Mul", "x", "c", f32)
        binary(g, "s", "Add", "m", "c", f32)
        handle = self.create(g.graph_def)

        response = self.run_step(
            handle, feeds=[("x", tensor_proto(f32, [3], [1.0, 2.0, 3.0]))],
            fetches=["s", "m:0"])
        self.assertEqual([t.name for t in response.tensor], ["s", "m:0"])
        self.assertEqual(tensor_values(response.tensor[0].tensor),
                         ([3], [2.0, 6.0, 12.0]))
        self.assertEqual(tensor_values(response.tensor[1].tensor),
                         ([3], [1.0, 4.0, 9.0]))
        self.assertEqual(response.tensor[0].tensor.dtype, f32)

    def test_partial_run_across_rpcs_sees_one_draw(self):
        handle = self.create(seed_example())
        self.run_step(handle, targets=["init"])
        setup = pb.service.PartialRunSetupRequest(
            session_handle=handle, feed=["a", "b"], fetch=["y1", "y2"])
        partial = self.stub.PartialRunSetup(setup, timeout=RPC_TIMEOUT)
        self.assertTrue(partial.partial_run_handle.startswith("pr-"))

        def step(feed, value, fetch):
            request = pb.service.PartialRunRequest(
                session_handle=handle,
                partial_run_handle=partial.partial_run_handle, fetch=[fetch])
            request.feed.add(
                name=feed, tensor=tensor_proto(pb.types.DT_FLOAT, [], [value]))
            response = self.stub.PartialRun(request, timeout=RPC_TIMEOUT)
            self.assertEqual(response.tensor[0].name, fetch)
            dims, values = tensor_values(response.tensor[0].tensor)
            self.assertEqual(dims, [])
            return values[0]

        y1 = step("a", 2.0, "y1")
        y2 = step("b", 4.0, "y2")
        # One draw in [0, 1): scaling by powers of two is exact.
        self.assertEqual(y1 / 2.0, y2 / 4.0)
        self.assertTrue(0.0 <= y1 / 2.0 < 1.0)
        # The stage gated by the counter ran once for both calls.
        count = self.run_step(handle, fetches=["count"])
        self.assertEqual(tensor_values(count.tensor[0].tensor), ([], [1.0]))

    def test_unknown_fetch_is_not_found_naming_it(self):
        g = GraphBuilder()
        const(g, "one", pb.types.DT_FLOAT, [], [1.0])
        handle = self.create(g.graph_def)
        details = self.assert_rpc_error(
            grpc.StatusCode.NOT_FOUND, self.run_step, handle, (),
            ["nosuch:0"])
        self.assertIn("nosuch", details)

    def test_bad_graph_is_invalid_argument_naming_the_node(self):
        g = GraphBuilder()
        const(g, "a", pb.types.DT_FLOAT, [], [1.0])
        g.node("s", "SaveV2", ["a"])
        details = self.assert_rpc_error(
            grpc.StatusCode.INVALID_ARGUMENT, self.create, g.graph_def)
        self.assertIn("node 's' (SaveV2)", details)

    def test_close_then_run_is_not_found(self):
        g = GraphBuilder()
        const(g, "one", pb.types.DT_FLOAT, [], [1.0])
        handle = self.create(g.graph_def)
        self.stub.CloseSession(
            pb.service.CloseSessionRequest(session_handle=handle),
            timeout=RPC_TIMEOUT)
        details = self.assert_rpc_error(
            grpc.StatusCode.NOT_FOUND, self.run_step, handle, (), ["one"])
        self.assertIn(handle, details)

    def test_health_is_serving(self):
        health = pb.health_grpc.HealthStub(self.server.channel)
        response = health.Check(pb.health.HealthCheckRequest(service=""),
                                timeout=RPC_TIMEOUT)
        self.assertEqual(response.status,
                         pb.health.HealthCheckResponse.SERVING)


class ServerLifecycleTest(unittest.TestCase):
    """A server of its own: serving, then SIGTERM ends it with status 0."""

    def test_sigterm_exits_zero(self):
        server = ServerProcess(SERVER)
        try:
            health = pb.health_grpc.HealthStub(server.channel)
            response = health.Check(pb.health.HealthCheckRequest(),
                                    timeout=RPC_TIMEOUT)
            self.assertEqual(response.status,
                             pb.health.HealthCheckResponse.SERVING)
        finally:
            code = server.terminate()
        self.assertEqual(code, 0)


def main():
    global SERVER, grpc, pb
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", required=True,
                        help="the graphrun-server binary")
    parser.add_argument("--stubs", required=True,
                        help="the directory of the generated Python stubs")
    args, rest = parser.parse_known_args()
    try:
        import grpc as grpc_module
        import google.protobuf  # noqa: F401
    except ImportError as e:
        print("SKIPPED: %s cannot import grpc/protobuf (%s); install Debian's "
              "python3-grpcio and python3-protobuf" % (sys.executable, e))
        return SKIP
    grpc = grpc_module
    SERVER = args.server
    pb = Stubs(args.stubs)
    FORMATS.update({
        pb.types.DT_FLOAT: "f", pb.types.DT_DOUBLE: "d",
        pb.types.DT_INT32: "i", pb.types.DT_INT64: "q",
        pb.types.DT_BOOL: "?",
    })
    program = unittest.main(argv=[sys.argv[0]] + rest, exit=False,
                            verbosity=2)
    return 0 if program.result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
