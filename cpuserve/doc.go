// Package cpuserve is Prism's CPU tier: the embedding store (cpuserve/store)
// with its in-memory hot tier (cpuserve/store/hot), lookup and pooling,
// online updates and model versions. The gRPC server around it lives here
// too (next issue); the store itself imports no server package.
package cpuserve
