-- wrk script: one row per request on the Open Inference Protocol v2 route, JSON tensors.
wrk.method = "POST"
wrk.body = '{"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1.0, 1.0, 1.0, 1.0]}]}'
wrk.headers["Content-Type"] = "application/json"
