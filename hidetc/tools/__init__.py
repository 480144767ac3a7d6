"""The tools around the compiler: the command line (`cli`), `hidetc bench` (`bench`,
`bench_torch`), `hidetc inspect` (`inspect`), the ONNX backend adapter
(`onnx_backend`) and the ONNX node-test runner (`conformance`)."""
