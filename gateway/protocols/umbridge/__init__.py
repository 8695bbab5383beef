"""UM-Bridge protocol 1.0: a listener for UM-Bridge clients and an upstream
client for UM-Bridge servers, plus the vector <-> tensor bridge to V2 models."""
