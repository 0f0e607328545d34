-- wrk script: one JSON row per request, as a single caller would send it.
wrk.method = "POST"
wrk.body = "[[1.0, 1.0, 1.0, 1.0]]"
wrk.headers["Content-Type"] = "application/json"
