package etcd

import (
	"context"
	"errors"
	"strconv"
	"sync"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
)

// authenticate is the method that fetches a token: it is sent without one.
const authenticate = "/etcdserverpb.Auth/Authenticate"

// tokens is the URL's user's auth token, sent with every request, fetched
// when first needed and again once the server refused it. It stands in for
// the official client's own token handling, which sends the refused token
// with the request for a new one: etcd 3.4 refuses that request for the
// token, and the client asks again and again until the request's deadline,
// after any password change or restart of the member.
type tokens struct {
	user, password string
	cc             grpc.ClientConnInterface // the client's, set before any request

	mu  sync.Mutex
	tok string
	off bool // the server said authentication is off: send none
	gen int  // how many tokens were dropped: watches' streams are per token
}

// GetRequestMetadata is the token for a request, fetched if there is none
// (credentials.PerRPCCredentials).
func (a *tokens) GetRequestMetadata(ctx context.Context, _ ...string) (map[string]string, error) {
	if ri, ok := credentials.RequestInfoFromContext(ctx); ok && ri.Method == authenticate {
		return nil, nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.off {
		return nil, nil
	}
	if a.tok == "" {
		resp, err := pb.NewAuthClient(a.cc).Authenticate(ctx, &pb.AuthenticateRequest{Name: a.user, Password: a.password})
		switch {
		case errors.Is(rpctypes.Error(err), rpctypes.ErrAuthNotEnabled):
			a.off = true
			return nil, nil
		case err != nil:
			// The request fails with this status where gRPC allows its
			// code (Unavailable for a leader that changed, which is
			// worth another try), or else with Internal and these words
			// in its message, where classify reads etcd's.
			return nil, err
		}
		a.tok = resp.Token
	}
	return map[string]string{rpctypes.TokenFieldNameGRPC: a.tok}, nil
}

// RequireTransportSecurity is false: etcd:// sends the token, as etcdctl does,
// without TLS.
func (a *tokens) RequireTransportSecurity() bool { return false }

// drop forgets the token after the server refused it, so that the next
// request fetches a new one.
func (a *tokens) drop() {
	if a == nil {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.tok, a.off = "", false
	a.gen++
}

// watchContext is ctx for a watch: the official client keeps one stream for
// the watches of the same metadata, and a stream's token is the one it was
// opened with, so a watch after a token was dropped needs a stream of its
// own.
func (a *tokens) watchContext(ctx context.Context) context.Context {
	if a == nil {
		return ctx
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return metadata.AppendToOutgoingContext(ctx, "withlock-token", strconv.Itoa(a.gen))
}

// refused reports whether err is the server refusing the token of a
// request, not its user: a token that expired, that a restart or a change
// of the user's password invalidated, or that is older than a change of
// any user or role. The request can be sent again with a new one.
func refused(err error) bool {
	ee := rpctypes.Error(err)
	return errors.Is(ee, rpctypes.ErrInvalidAuthToken) || errors.Is(ee, rpctypes.ErrAuthOldRevision)
}

// dropRefused is a unary interceptor that drops the token the server
// refused: the official client's own interceptor, around it, then sends
// the request again, and it goes with a new token.
func (a *tokens) dropRefused(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	err := invoker(ctx, method, req, reply, cc, opts...)
	if err != nil && refused(err) {
		a.drop()
	}
	return err
}

// watchRefused drops the token if err, the end of a watch, is a refusal of
// it: "permission denied" too, etcd 3.4's word for a token it no longer
// knows (a real denial meets the new token too, and the request that
// follows the watch says so).
func (b *backend) watchRefused(err error) {
	if b.auth != nil && err != nil && (refused(err) || errors.Is(etcdError(err), rpctypes.ErrPermissionDenied)) {
		b.auth.drop()
	}
}
