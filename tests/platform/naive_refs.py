"""Loop-based, obviously-correct references, transcribed line by line from sglang's Triton
kernels (one Python iteration per Triton program / loop step)."""

from __future__ import annotations


def assign_req_to_token_pool(req_pool_indices, req_to_token, start, end, out_cache_loc):
    off = 0
    for b in range(len(start)):
        for j in range(int(start[b]), int(end[b])):
            req_to_token[req_pool_indices[b], j] = out_cache_loc[off]
            off += 1


def assign_extend_cache_locs(req_pool_indices, req_to_token, start, end, out_cache_loc):
    off = 0
    for b in range(len(start)):
        for j in range(int(start[b]), int(end[b])):
            out_cache_loc[off] = req_to_token[req_pool_indices[b], j]
            off += 1


def assign_draft_cache_locs_contiguous(req_pool_indices, req_to_token, seq_lens, out, topk, steps):
    w = topk * steps
    for b in range(len(seq_lens)):
        for j in range(w):
            out[b * w + j] = req_to_token[req_pool_indices[b], int(seq_lens[b]) + j]


def fill_bonus_tokens(accept_tokens, accept_lens, bonus, stride):
    flat = accept_tokens.reshape(-1)
    for b in range(len(accept_lens)):
        bonus[b] = flat[stride * b + int(accept_lens[b]) - 1]


def fill_accept_out_cache_loc(accept_index, out_cache_loc, dst_buf):
    flat = accept_index.reshape(-1)
    for pid in range(flat.numel()):
        dst = int((flat[:pid] != -1).sum())
        if flat[pid] > -1:
            dst_buf[dst] = out_cache_loc[flat[pid]]


def verify_tree_greedy(predicts, accept_index, accept_token_num, candidates, r_idx, r_next, r_sib, target):
    bs, n = candidates.shape
    num_spec = accept_index.shape[1]
    tflat = target.reshape(-1)
    for bx in range(bs):
        last = int(r_idx[bx, 0])
        accept_index[bx, 0] = last
        num = 0
        cur = 0
        for _j in range(1, num_spec):
            cur = int(r_next[bx, cur])
            found = False
            while cur != -1:
                draft_index = int(r_idx[bx, cur])
                if candidates[bx, cur] == tflat[last]:
                    predicts.reshape(-1)[last] = tflat[last]
                    num += 1
                    accept_index[bx, num] = draft_index
                    last = draft_index
                    found = True
                    break
                cur = int(r_sib[bx, cur])
            if not found:
                break
        accept_token_num[bx] = num
        predicts.reshape(-1)[last] = tflat[last]


def build_tree(parent_list, sel, seq_lens, tree_mask, positions, r_idx, r_next, r_sib, topk, depth, n, mode):
    bs = len(seq_lens)
    prefix = 0
    for b in range(bs):
        seq_len = int(seq_lens[b])
        seq_tree_idx = n * n * b + prefix * n
        prefix += seq_len
        positions[b * n] = seq_len
        for i in range(n - 1, 0, -1):
            r_idx[b * n + i] = b * n + i
            ptb = int(sel[b, i - 1]) // topk
            ppos, found = 0, ptb == 0
            if not found:
                ptok = parent_list[b, ptb]
                for pp in range(n - 1):
                    if sel[b, pp] == ptok:
                        ppos, found = pp + 1, True
                        break
            if found:
                nt = int(r_next[b * n + ppos])
                r_next[b * n + ppos] = i
                if nt != -1:
                    r_sib[b * n + i] = nt
        r_idx[b * n] = b * n
        for x in range(n):
            if mode == 0:
                t = seq_tree_idx + (seq_len + n) * x + seq_len + 1
            else:
                t = n * n * b + n * x + 1
            tree_mask[t - 1] = True
            for i in range(n - 1):
                tree_mask[t + i] = False
            if x > 0:
                cur, pos = x - 1, 0
                for _ in range(depth):
                    pos += 1
                    tree_mask[t + cur] = True
                    ptb = int(sel[b, cur]) // topk
                    if ptb == 0:
                        break
                    ptok = parent_list[b, ptb]
                    nxt = [cp for cp in range(n - 1) if sel[b, cp] == ptok]
                    if not nxt:
                        break
                    cur = nxt[0]
                positions[b * n + x] = pos + seq_len


def reconstruct(tree_mask, seq_lens, positions, r_idx, r_next, r_sib, bs, n):
    m = tree_mask.reshape(bs, n, n)
    for b in range(bs):
        parent = []
        for i in range(n):
            anc = [j for j in range(i) if m[b, i, j]]
            positions[b * n + i] = len(anc) + int(seq_lens[b])
            r_idx[b * n + i] = b * n + i
            parent.append(max(anc) if anc else -1)
        for t in range(n):
            kids = [k for k in range(t + 1, n) if m[b, k, t]]
            r_next[b * n + t] = kids[0] if kids else -1
            sib = [k for k in range(t + 1, n) if parent[k] == parent[t]]
            r_sib[b * n + t] = sib[0] if (sib and parent[t] >= 0) else -1
