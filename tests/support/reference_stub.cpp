// Keeps cutrain_reference non-empty before any reference exists.
