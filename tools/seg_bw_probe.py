"""DRAM read rate of strided segments (session 23): would channel-tile rounds suit channels-last batch norm?

A round of a channels-last kernel that takes Ct of a row's C channels reads S = Ct * itemsize bytes of every P-byte
row.  This times reading S bytes of each row (one 16-byte vector a thread, grid-stride, the sum kept) against
reading whole rows, over one buffer of ~206 MB (the float32 backward's x and dy of a (32, 256, 56, 56) tensor).
Prints GB/s of useful bytes and the share of the whole-row rate.   python3 tools/seg_bw_probe.py
"""
import cupy as cp

SRC = r"""
extern "C" __global__ void seg(const float4* __restrict__ x, float* __restrict__ out, long long rows, int lpv, int lsv,
                               int off)
{
    long long n = rows << lsv; int sv = 1 << lsv;
    float acc = 0.f;
    long long step = (long long)gridDim.x * blockDim.x;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += step) {
        long long r = i >> lsv; int v = (int)(i & (sv - 1));
        float4 a = __ldcs(x + (r << lpv) + off + v);
        acc += a.x + a.y + a.z + a.w;
    }
    if (acc == 12345.f) out[0] = acc;
}
"""


def main():
    k = cp.RawKernel(SRC, "seg")
    total = 206 * 2 ** 20
    buf = cp.ones(total // 4, cp.float32)
    out = cp.zeros(1, cp.float32)
    sm = cp.cuda.Device().attributes["MultiProcessorCount"]
    grid = sm * 8
    for P in (128, 256, 512, 1024):
        rows = total // P
        pv = P // 16
        base = None
        for S in (P, 256, 128, 64, 32):
            if S > P:
                continue
            sv = S // 16
            nrounds = P // S
            args = (buf, out, cp.int64(rows), cp.int32(pv.bit_length() - 1), cp.int32(sv.bit_length() - 1))
            def once():
                for r in range(nrounds):
                    k((grid,), (256,), args + (cp.int32(r * sv),))
            once()
            cp.cuda.Device().synchronize()
            best = 1e9
            for _ in range(7):
                e0, e1 = cp.cuda.Event(), cp.cuda.Event()
                e0.record()
                once()
                e1.record()
                e1.synchronize()
                best = min(best, cp.cuda.get_elapsed_time(e0, e1))
            gbs = total / best / 1e6
            base = base or gbs
            print(f"row {P:5d} B  segment {S:4d} B  ({nrounds:2d} rounds)  {best:.4f} ms  {gbs:7.0f} GB/s  "
                  f"{gbs / base:5.2f} of whole rows")


if __name__ == "__main__":
    main()
