import { fireEvent, render, screen } from '@testing-library/react'
import { afterEach, describe, expect, it, vi } from 'vitest'
import { jsonResponse } from '../test/fixtures'
import { EvaluationSection } from './EvaluationSection'
import { ModelSearch } from './ModelSearch'

afterEach(() => {
  vi.unstubAllGlobals()
})

describe('EvaluationSection', () => {
  it('stays hidden when the job has no evaluation (404)', async () => {
    const fetchMock = vi.fn<typeof fetch>().mockResolvedValue(jsonResponse({ detail: 'No evaluation' }, 404))
    vi.stubGlobal('fetch', fetchMock)
    const { container } = render(<EvaluationSection jobId={7} />)
    await vi.waitFor(() => expect(fetchMock).toHaveBeenCalledWith('/api/jobs/7/evaluation', expect.anything()))
    await new Promise((r) => setTimeout(r, 0))
    expect(container).toBeEmptyDOMElement()
  })

  it('shows the eval loss before and after and the answers side by side', async () => {
    vi.stubGlobal('fetch', vi.fn<typeof fetch>().mockResolvedValue(jsonResponse({
      status: 'done', error: null, base_eval_loss: 2.5, tuned_eval_loss: 1.25,
      samples: [{ prompt: 'What is 2 plus 2?', reference: '4', base_answer: 'Five', tuned_answer: '2 plus 2 is 4.', base_overlap: 0, tuned_overlap: 1 }],
      scores: { base_overlap: 0, tuned_overlap: 1 },
    })))
    render(<EvaluationSection jobId={7} />)
    const figures = await screen.findByTestId('evaluation-figures')
    expect(figures).toHaveTextContent('2.5')
    expect(figures).toHaveTextContent('1.25')
    expect(figures).toHaveTextContent('−50.0 %')
    expect(screen.getByRole('row', { name: /What is 2 plus 2\?/ })).toHaveTextContent('2 plus 2 is 4.')
  })

  it('says why a failed evaluation failed', async () => {
    vi.stubGlobal('fetch', vi.fn<typeof fetch>().mockResolvedValue(jsonResponse({
      status: 'failed', error: 'out of memory', base_eval_loss: null, tuned_eval_loss: null, samples: [], scores: null,
    })))
    render(<EvaluationSection jobId={7} />)
    expect(await screen.findByText(/The evaluation failed: out of memory/)).toBeInTheDocument()
  })
})

describe('ModelSearch', () => {
  it('says plainly that the hub is offline when the server cannot reach it', async () => {
    vi.stubGlobal('fetch', vi.fn<typeof fetch>().mockResolvedValue(jsonResponse({ detail: 'offline: the model hub at https://huggingface.co cannot be reached' }, 503)))
    render(<ModelSearch chosen="" onChoose={() => undefined} />)
    fireEvent.change(screen.getByRole('searchbox'), { target: { value: 'qwen' } })
    fireEvent.click(screen.getByRole('button', { name: 'Search' }))
    expect(await screen.findByTestId('hub-offline')).toHaveTextContent('Offline: this server cannot reach the model hub.')
  })

  it('lists what the hub found and picks one', async () => {
    vi.stubGlobal('fetch', vi.fn<typeof fetch>().mockResolvedValue(jsonResponse([{ id: 'Qwen/Qwen2.5-0.5B-Instruct', downloads: 1000, likes: 5 }])))
    const onChoose = vi.fn()
    render(<ModelSearch chosen="" onChoose={onChoose} />)
    fireEvent.change(screen.getByRole('searchbox'), { target: { value: 'qwen' } })
    fireEvent.keyDown(screen.getByRole('searchbox'), { key: 'Enter' })
    fireEvent.click(await screen.findByRole('radio', { name: /Qwen\/Qwen2.5-0.5B-Instruct/ }))
    expect(onChoose).toHaveBeenCalledWith('Qwen/Qwen2.5-0.5B-Instruct')
  })
})
