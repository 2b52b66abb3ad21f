import sys,collections
def load(f):
    for line in open(f):
        stack,_,n=line.rstrip().rpartition(' ')
        yield [fr.strip().split(' ')[0] for fr in stack.split(';')], int(n)
for f,excl in (('echo-cost.raw','EAGLEWorkerV2._forward_prefill_batch'),('none.raw','EagerRunner._execute_extend')):
    step=mlp=attn=0; c=collections.Counter()
    for names,n in load(f):
        if 'Scheduler.run_batch' not in names or excl in names: continue
        step+=n
        if 'LlamaMLP.forward' in names: mlp+=n
        if 'RadixAttention.forward' in names: attn+=n
        for k in ('_draft_extend_for_decode','EchoDraftWorker.draft','LogitsProcessor.forward','_finalize_accept_tree_path','eagle_sample','move_accept_tokens_to_target_kvcache','Sampler.forward','LlamaModel.forward'):
            if any(k in x for x in names): c[k]+=n
    print(f, 'step samples',step,'step/mlp=%.2f'%(step/mlp),'attn/mlp=%.2f'%(attn/mlp), {k:round(v/mlp,3) for k,v in c.items()})
